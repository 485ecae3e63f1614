//! Every golden message fits the payload schema of exactly one message of its channel in
//! `docs/asyncapi.yaml` (as generated), and no message accepts an empty object. Checked by
//! `scripts/contract_check.py asyncapi` with jsonschema (the venv of scripts/contract-tools.sh),
//! whose draft 2020-12 validator reads the schemars-generated payload schemas as written. That the
//! document itself is a valid AsyncAPI 3.0 document is `asyncapi_spec.rs`'s test (roas-asyncapi's
//! AsyncAPI 3.0 validator; the official JSON Schema of the specification is not available offline).

use std::path::Path;

use imagepipe_contracts::names::{self, queues};
use imagepipe_contracts::testing::{contract_python, run_contract_check};
use imagepipe_contracts::{CommandType, EventType};
use serde_json::{Value, json};

/// The channel addresses (default prefix) a golden file's message travels on.
fn addresses(file: &str) -> Vec<String> {
    let name = file.strip_suffix(".json").unwrap_or(file);
    let queue = |q: &str| vec![format!("imagepipe.{q}")];
    if let Some(event_type) = name.strip_prefix("event.") {
        let event_type: EventType = event_type.parse().unwrap_or_else(|e| panic!("golden/{file}: {e}"));
        return vec![
            format!("imagepipe.{}.{event_type}", names::topics::EVENTS),
            format!("imagepipe.{}", names::topic_of_event_type(event_type.as_str())),
        ];
    }
    match name.split('.').next() {
        Some("submit") => queue(CommandType::Submit.queue()),
        Some("result") => queue(queues::RESULTS),
        Some("command") => match name {
            "command.download" => queue(queues::DOWNLOAD),
            "command.metadata" => queue(queues::METADATA),
            "command.analyze" => queue(queues::AI),
            "command.stage" => queue(CommandType::Stage.queue()),
            other => panic!("golden/{other}.json: no command of that name"),
        },
        _ => panic!("golden/{file}: which channel does it travel on?"),
    }
}

#[test]
fn every_golden_message_fits_its_channel_in_the_asyncapi_document() {
    let Some(python) = contract_python() else { return };
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut golden = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(manifest.join("golden")).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    for path in files {
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        let body: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        for address in addresses(&file) {
            golden.push(json!({ "file": file, "address": address, "body": body }));
        }
    }
    assert!(golden.len() >= 25 + 13, "every golden file, events on two channels each");

    let dir = tempfile::tempdir().unwrap();
    let document = dir.path().join("asyncapi.json");
    let golden_path = dir.path().join("golden.json");
    let doc = imagepipe_contracts::asyncapi::document().unwrap();
    std::fs::write(&document, serde_json::to_vec(&doc).unwrap()).unwrap();
    std::fs::write(&golden_path, serde_json::to_vec(&golden).unwrap()).unwrap();
    run_contract_check(
        &python,
        &manifest.join("../.."),
        &["asyncapi".as_ref(), document.as_os_str(), golden_path.as_os_str()],
    );
}
