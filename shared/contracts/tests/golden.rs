//! Every message type round-trips through its golden JSON file unchanged, so the wire format
//! cannot drift by accident.

use std::path::{Path, PathBuf};

use imagepipe_contracts::payload::{
    ImageAnalyzed, ImageDownloaded, ImageDuplicateDetected, ImageMetadataExtracted, QueuePaused, QueueResumed,
    StageCompleted, TaskCancelled, TaskCompleted, TaskCreated, TaskFailed, TaskPaused, TaskResumed, TaskRetrying,
};
use imagepipe_contracts::{
    AnalyzeCommand, DownloadCommand, Event, EventPayload, EventType, MetadataCommand, StageCommand, StepResult,
    SubmitTask, decode,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

fn golden(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("golden").join(name)
}

fn read(name: &str) -> Vec<u8> {
    std::fs::read(golden(name)).unwrap_or_else(|e| panic!("golden/{name}: {e}"))
}

/// Decodes the golden file as `T`, encodes it again and compares the JSON trees.
fn round_trip<T: Serialize + DeserializeOwned>(name: &str) -> T {
    let bytes = read(name);
    let typed: T = decode(&bytes).unwrap_or_else(|e| panic!("golden/{name}: {e}"));
    let original: Value = serde_json::from_slice(&bytes).unwrap();
    let again = serde_json::to_value(&typed).unwrap();
    assert_eq!(again, original, "golden/{name} changed on a round trip");
    typed
}

fn event_round_trip<P: EventPayload>() {
    let name = format!("event.{}.json", P::EVENT_TYPE);
    let event: Event<P> = round_trip(&name);
    assert_eq!(event.event_type, P::EVENT_TYPE);
    let untyped: Event<Value> = decode(&read(&name)).unwrap();
    let typed = untyped.into_typed::<P>().unwrap();
    assert_eq!(serde_json::to_value(typed).unwrap(), serde_json::to_value(event).unwrap());
}

#[test]
fn every_event_type_round_trips() {
    event_round_trip::<ImageDownloaded>();
    event_round_trip::<ImageMetadataExtracted>();
    event_round_trip::<ImageAnalyzed>();
    event_round_trip::<ImageDuplicateDetected>();
    event_round_trip::<TaskCreated>();
    event_round_trip::<TaskRetrying>();
    event_round_trip::<TaskCompleted>();
    event_round_trip::<TaskFailed>();
    event_round_trip::<TaskCancelled>();
    event_round_trip::<TaskPaused>();
    event_round_trip::<TaskResumed>();
    event_round_trip::<QueuePaused>();
    event_round_trip::<QueueResumed>();
    event_round_trip::<StageCompleted>();
}

#[test]
fn every_event_type_has_a_golden_file() {
    for t in EventType::ALL {
        assert!(golden(&format!("event.{t}.json")).exists(), "no golden file for {t}");
    }
}

#[test]
fn submit_commands_round_trip_and_validate() {
    for name in ["submit.full.json", "submit.minimal.json", "submit.blob.json"] {
        let submit: SubmitTask = round_trip(name);
        submit.validate().unwrap_or_else(|e| panic!("golden/{name} is invalid: {e}"));
    }
}

#[test]
fn step_commands_round_trip() {
    round_trip::<DownloadCommand>("command.download.json");
    round_trip::<MetadataCommand>("command.metadata.json");
    round_trip::<AnalyzeCommand>("command.analyze.json");
    let stage: StageCommand = round_trip("command.stage.json");
    assert_eq!(stage.stage.as_str(), "faces");
    assert!(stage.stage.is_custom());
}

#[test]
fn step_results_round_trip() {
    for name in [
        "result.download.ok.json",
        "result.metadata.ok.json",
        "result.analyze.ok.json",
        "result.download.retryable.json",
        "result.metadata.permanent.json",
        "result.download.deferred.json",
        "result.faces.ok.json",
    ] {
        let result: StepResult = round_trip(name);
        if let imagepipe_contracts::StepOutcome::Ok { output } = &result.outcome {
            assert!(output.belongs_to(result.step), "golden/{name}: output of another step");
        }
    }
}

#[test]
fn a_typed_payload_refuses_an_event_of_another_type() {
    let untyped: Event<Value> = decode(&read("event.task.failed.json")).unwrap();
    let err = untyped.into_typed::<TaskCompleted>().unwrap_err();
    assert_eq!(err.path, "eventType");
}

#[test]
fn an_ill_typed_payload_field_is_named() {
    let mut json: Value = serde_json::from_slice(&read("event.image.downloaded.json")).unwrap();
    json["payload"]["size"] = Value::from("big");
    let err = decode::<Event<ImageDownloaded>>(json.to_string().as_bytes()).unwrap_err();
    // `size` sits in a flattened struct, so the path stops at `payload`; the message still says what.
    assert_eq!(err.path, "payload", "{err}");
    assert!(err.message.contains("expected u64"), "{err}");

    json["payload"].as_object_mut().unwrap().remove("size");
    let err = decode::<Event<ImageDownloaded>>(json.to_string().as_bytes()).unwrap_err();
    assert!(err.to_string().contains("missing field `size`"), "{err}");
}
