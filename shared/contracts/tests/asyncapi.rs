//! The committed AsyncAPI document, `docs/asyncapi.yaml`, matches the types.

use std::path::{Path, PathBuf};

/// `docs/asyncapi.yaml` of the workspace.
fn committed() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/asyncapi.yaml")
}

/// What the generated document is written as.
const HEADER: &str = "# The AsyncAPI 3.0 document of imagepipe's messages, generated from shared/contracts\n\
# (src/asyncapi.rs); do not edit. Regenerate with\n\
#   IMAGEPIPE_UPDATE_SCHEMAS=1 cargo test -p imagepipe-contracts --test asyncapi\n";

#[test]
fn the_committed_document_matches_the_types() {
    let document = imagepipe_contracts::asyncapi::document().expect("the document");
    let generated = format!("{HEADER}{}", serde_yaml::to_string(&document).expect("YAML"));
    let path = committed();
    if std::env::var_os("IMAGEPIPE_UPDATE_SCHEMAS").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        text == generated,
        "docs/asyncapi.yaml is out of date; regenerate with IMAGEPIPE_UPDATE_SCHEMAS=1 cargo test -p imagepipe-contracts --test asyncapi"
    );
    // Read as YAML, it is the document (no YAML quirk changed a value).
    let read: serde_json::Value = serde_yaml::from_str(&text).expect("docs/asyncapi.yaml is YAML");
    assert_eq!(read, document);
}
