//! The committed JSON Schemas in `schema/` match the types.

use std::path::Path;

#[test]
fn committed_schemas_match_the_types() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("schema");
    let update = std::env::var_os("IMAGEPIPE_UPDATE_SCHEMAS").is_some();
    let mut drifted = Vec::new();
    for (name, schema) in imagepipe_contracts::schema::all() {
        let path = dir.join(&name);
        let generated = serde_json::to_string_pretty(&schema).unwrap() + "\n";
        if update {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &generated).unwrap();
        } else if std::fs::read_to_string(&path).ok().as_deref() != Some(generated.as_str()) {
            drifted.push(name);
        }
    }
    assert!(
        drifted.is_empty(),
        "schemas out of date: {drifted:?}; regenerate with IMAGEPIPE_UPDATE_SCHEMAS=1 cargo test -p imagepipe-contracts --test schema"
    );
}

#[test]
fn the_submit_schema_requires_a_url_or_a_blob() {
    let schema = serde_json::to_value(schemars::schema_for!(imagepipe_contracts::SubmitTask)).unwrap();
    assert_eq!(schema["oneOf"], serde_json::json!([{"required": ["url"]}, {"required": ["blob"]}]));
    assert_eq!(schema["properties"]["idempotencyKey"]["type"], serde_json::json!(["string", "null"]));
}

#[test]
fn the_envelope_schema_names_every_required_field() {
    let schema = serde_json::to_value(schemars::schema_for!(imagepipe_contracts::Event<serde_json::Value>)).unwrap();
    let mut required: Vec<_> = schema["required"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    required.sort_unstable();
    assert_eq!(required, ["eventId", "eventType", "payload", "source", "timestamp", "traceId"]);
}
