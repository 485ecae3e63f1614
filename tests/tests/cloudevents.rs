//! What the workers publish, read raw off real NATS and real Kafka (Tansu in CI), is a
//! CloudEvent to the CloudEvents Python SDK in binary content mode: an `image.downloaded` event
//! and its step result, sent by the step reporter every worker reports through, each read
//! back with the broker's own client and handed with its headers and body to
//! `scripts/contract_check.py cloudevents` (the venv of scripts/contract-tools.sh), which
//! reads them with the SDK's Kafka binding (`ce_*` headers) or, for NATS, its HTTP binding
//! (`ce-*` headers, the same names as the NATS binding's) and compares id, type, source,
//! specversion, time, subject, datacontenttype and data; then checks that a wrong header fails.
//! The raw headers and body must also fit their message in the AsyncAPI document.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use imagepipe_bus::Bus;
use imagepipe_contracts::cloudevents::time_of;
use imagepipe_contracts::payload::ImageDownloaded;
use imagepipe_contracts::step::DownloadOutput;
use imagepipe_contracts::testing::{contract_python, run_contract_check};
use imagepipe_contracts::{EventType, Priority, Step, StepOutput, event_id};
use imagepipe_e2e::backend::{Backend, Cleanup};
use imagepipe_runtime::clock::ManualClock;
use imagepipe_runtime::step::{Attempt, StepReporter};
use serde_json::{Value, json};

/// When the manual clock says the event happened (and the result was sent).
const AT_MS: u64 = 1_763_800_000_123;

/// A raw message as read from the broker.
struct Raw {
    address: String,
    key: Option<String>,
    headers: BTreeMap<String, String>,
    body: String,
}

fn output() -> DownloadOutput {
    DownloadOutput {
        blob_key: "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08".into(),
        size: 48_213,
        sha256: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08".into(),
        format: "jpeg".into(),
        final_url: Some("https://example.com/cat.jpg".into()),
    }
}

/// Reports a successful download of `task_id` through our code: its event and its result.
async fn report(bus: Bus, task_id: &str) {
    let reporter = StepReporter::new(bus, "download-worker", Arc::new(ManualClock::at_unix_ms(AT_MS)));
    let attempt =
        Attempt { task_id: task_id.into(), step: Step::Download, attempt: 2, priority: Priority::Normal, shard: None };
    let payload = ImageDownloaded { image: output(), labels: [("album".into(), "summer".into())].into() };
    reporter.succeeded(&attempt, Some(payload), StepOutput::Download(output())).await.expect("report the step");
}

/// The check's cases: the event and the result of `task_id`, as read on `binding`.
fn cases(binding: &str, prefix: &str, task_id: &str, raw: Vec<Raw>) -> Value {
    let event_address = format!("{prefix}.events.image.downloaded");
    let kafka_event_topic = format!("{prefix}.events.image");
    let results = format!("{prefix}.tasks.results");
    let mut out = Vec::new();
    for message in raw {
        let (name, id, ce_type, component) = if message.address == event_address || message.address == kafka_event_topic
        {
            (
                "event",
                event_id(task_id, EventType::ImageDownloaded, 2).to_string(),
                "image.downloaded",
                "event.image.downloaded",
            )
        } else if message.address == results {
            ("step result", format!("{task_id}:download:2"), "step.result", "stepResult")
        } else {
            continue;
        };
        out.push(json!({
            "name": format!("{binding} {name} on {}", message.address),
            "binding": binding,
            "key": message.key,
            "headers": message.headers,
            "body": message.body,
            "message": component,
            "expect": {
                "id": id,
                "type": ce_type,
                "source": "/imagepipe/download-worker",
                "time": time_of(AT_MS),
                "subject": task_id,
            },
        }));
    }
    assert_eq!(out.len(), 2, "the event and the result, read back: {out:#?}");
    Value::Array(out)
}

fn check(cases: &Value) {
    let Some(python) = contract_python() else { return };
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("cases.json");
    std::fs::write(&path, serde_json::to_vec_pretty(cases).unwrap()).expect("write the cases");
    let document = dir.path().join("asyncapi.json");
    let asyncapi = imagepipe_contracts::asyncapi::document().expect("the AsyncAPI document");
    std::fs::write(&document, serde_json::to_vec(&asyncapi).unwrap()).expect("write the document");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    run_contract_check(&python, &root, &["cloudevents".as_ref(), path.as_os_str(), document.as_os_str()]);
}

fn unique(binding: &str) -> String {
    format!("ce_{binding}_{}", &uuid::Uuid::new_v4().simple().to_string()[..12])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_messages_are_cloudevents_to_the_python_sdk() {
    let backend = Backend::nats();
    let Backend::Nats { url } = &backend else { unreachable!() };
    let prefix = unique("nats");
    let _cleanup = Cleanup::new(&backend, &prefix);
    let bus = Bus::connect(&backend.bus_config(&prefix)).await.expect("connect the bus to NATS");
    let client = async_nats::connect(url.as_str()).await.expect("connect to NATS");
    let mut raw = client.subscribe(format!("{prefix}.>")).await.expect("subscribe");
    client.flush().await.expect("flush");

    let task_id = format!("tsk_{prefix}");
    report(bus, &task_id).await;

    let wanted = [format!("{prefix}.events.image.downloaded"), format!("{prefix}.tasks.results")];
    let mut read: Vec<Raw> = Vec::new();
    while read.len() < 2 {
        let message = tokio::time::timeout(Duration::from_secs(30), raw.next())
            .await
            .expect("the event and the result within 30 s")
            .expect("the subscription is open");
        let mut headers = BTreeMap::new();
        for (name, values) in message.headers.iter().flat_map(|map| map.iter()) {
            if let Some(value) = values.last() {
                headers.insert(name.to_string(), value.as_str().to_owned());
            }
        }
        if !wanted.contains(&message.subject.to_string()) {
            continue;
        }
        read.push(Raw {
            address: message.subject.to_string(),
            key: None,
            headers,
            body: String::from_utf8(message.payload.to_vec()).expect("a JSON body"),
        });
    }
    check(&cases("nats", &prefix, &task_id, read));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_messages_are_cloudevents_to_the_python_sdk() {
    use rdkafka::Message as _;
    use rdkafka::consumer::{Consumer, StreamConsumer};
    use rdkafka::message::Headers as _;

    let backend = Backend::kafka();
    let Backend::Kafka { brokers } = &backend else { unreachable!() };
    let prefix = unique("kafka");
    let _cleanup = Cleanup::new(&backend, &prefix);
    let bus = Bus::connect(&backend.bus_config(&prefix)).await.expect("connect the bus to Kafka");
    let task_id = format!("tsk_{prefix}");
    report(bus, &task_id).await;

    let consumer: StreamConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("{prefix}-reader"))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()
        .expect("a Kafka consumer");
    let topics = [format!("{prefix}.events.image"), format!("{prefix}.tasks.results")];
    consumer.subscribe(&topics.iter().map(String::as_str).collect::<Vec<_>>()).expect("subscribe");
    let mut read = Vec::new();
    while read.len() < 2 {
        let message = tokio::time::timeout(Duration::from_secs(60), consumer.recv())
            .await
            .expect("the event and the result within 60 s")
            .expect("a record");
        let mut headers = BTreeMap::new();
        for header in message.headers().iter().flat_map(|h| h.iter()) {
            let value = header.value.map(|v| String::from_utf8_lossy(v).into_owned()).unwrap_or_default();
            headers.insert(header.key.to_owned(), value);
        }
        read.push(Raw {
            address: message.topic().to_owned(),
            key: message.key().map(|k| String::from_utf8_lossy(k).into_owned()),
            headers,
            body: String::from_utf8(message.payload().unwrap_or_default().to_vec()).expect("a JSON body"),
        });
    }
    drop(consumer);
    check(&cases("kafka", &prefix, &task_id, read));
}
