//! The committed `docs/asyncapi.yaml` is a valid AsyncAPI 3.0 document: it is parsed into
//! roas-asyncapi's AsyncAPI 3.0 document model (`roas_asyncapi::v3_0::Document`) and checked by
//! that crate's AsyncAPI 3.0 validator, which must report no diagnostic (each is printed when it
//! does). The validator checks the objects the specification defines — the `asyncapi` version
//! (exactly `3.0.0`), the required fields, every channel's address against its parameters, every
//! `$ref` resolving inside the document (external ones are refused: the document is
//! self-contained), an operation's channel in the root `channels` and its messages among that
//! channel's. The model ignores a key the specification does not define rather than rejecting it,
//! so the test also asks that the parsed document, written back, is the committed one: nothing was
//! dropped (the payload schemas, whose keywords are JSON Schema's, are compared as they stand).
//! The official JSON Schema of the specification (asyncapi/spec-json-schemas) is not used: it is
//! not available offline here.
//!
//! That the check can fail: the same document with a channel's address naming an undeclared
//! parameter (or empty, or without its parameter), an operation's channel `$ref` pointing at no
//! channel, an operation's message that is not its channel's, a message `$ref` pointing at no
//! message, `asyncapi` missing or not `3.0.0`, or `info` missing, each gets diagnostics; a
//! misspelt key (`adress`) is reported as not read.

use std::path::Path;

use roas_asyncapi::v3_0::Document;
use roas_asyncapi::validation::{Validate, ValidationOptions};
use serde_json::{Value, json};

/// `docs/asyncapi.yaml` of the workspace, as text.
fn committed_text() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/asyncapi.yaml");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `docs/asyncapi.yaml` of the workspace, as JSON.
fn committed() -> Value {
    serde_yaml::from_str(&committed_text()).expect("docs/asyncapi.yaml is YAML")
}

/// Every diagnostic of the AsyncAPI 3.0 validator on `document`: why it is not an AsyncAPI 3.0
/// document at all, or each problem the validation found.
fn diagnostics(document: &Document) -> Vec<String> {
    match document.validate(ValidationOptions::ErrorOnExternalReference.into()) {
        Ok(()) => Vec::new(),
        Err(error) => error.errors.iter().map(ToString::to_string).collect(),
    }
}

/// Parsed and validated as an AsyncAPI 3.0 document: its diagnostics (a parse error is one).
fn diagnostics_of(document: &Value) -> Vec<String> {
    match serde_json::from_value::<Document>(document.clone()) {
        Ok(parsed) => diagnostics(&parsed),
        Err(e) => vec![format!("not an AsyncAPI 3.0 document: {e}")],
    }
}

/// Where `written` differs from `original` (JSON paths), e.g. a key the model dropped. In a payload
/// or header schema (`in_schema`) two things are the same schema and are not differences: a number
/// written back as a float (`0` as `0.0`), and the keys beside a `$ref`, which the model reads as a
/// Reference Object (JSON Schema draft-07, the dialect of AsyncAPI 3.0's Schema Object, ignores
/// them too; schemars writes a description there).
fn differences(original: &Value, written: &Value, path: &str, in_schema: bool, out: &mut Vec<String>) {
    match (original, written) {
        (Value::Object(a), Value::Object(b)) => {
            if in_schema && a.contains_key("$ref") && b.len() == 1 && b.get("$ref") == a.get("$ref") {
                return;
            }
            for (key, value) in a {
                let at = format!("{path}/{key}");
                let schema = in_schema || at == "#/components/schemas" || key == "payload" || key == "headers";
                match b.get(key) {
                    Some(other) => differences(value, other, &at, schema, out),
                    None => out.push(format!("{at}: dropped")),
                }
            }
            for key in b.keys().filter(|k| !a.contains_key(*k)) {
                out.push(format!("{path}/{key}: added"));
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                differences(x, y, &format!("{path}/{i}"), in_schema, out);
            }
        }
        (Value::Number(a), Value::Number(b)) if in_schema && a.as_f64() == b.as_f64() => {}
        (a, b) if a != b => out.push(format!("{path}: {a} became {b}")),
        _ => {}
    }
}

/// What of `document` the AsyncAPI 3.0 model does not read: the differences of the parsed
/// document, written back, from `document`.
fn unread(document: &Value) -> Vec<String> {
    let parsed: Document = serde_json::from_value(document.clone()).expect("an AsyncAPI 3.0 document");
    let written = serde_json::to_value(&parsed).unwrap();
    let mut changed = Vec::new();
    differences(document, &written, "#", false, &mut changed);
    changed
}

#[test]
fn the_committed_document_is_a_valid_asyncapi_3_0_document() {
    let text = committed_text();
    let document: Document = serde_yaml::from_str(&text)
        .unwrap_or_else(|e| panic!("docs/asyncapi.yaml is not an AsyncAPI 3.0 document: {e}"));
    let found = diagnostics(&document);
    assert!(
        found.is_empty(),
        "docs/asyncapi.yaml: {} diagnostics of the AsyncAPI 3.0 validator:\n{}",
        found.len(),
        found.join("\n")
    );
    assert!(!document.channels.is_empty() && !document.operations.is_empty());

    // Nothing the model does not know was silently dropped.
    let changed = unread(&committed());
    assert!(
        changed.is_empty(),
        "docs/asyncapi.yaml has what the AsyncAPI 3.0 model does not read:\n{}",
        changed.join("\n")
    );
}

#[test]
fn the_generated_document_is_a_valid_asyncapi_3_0_document() {
    let generated = imagepipe_contracts::asyncapi::document().expect("the document");
    let found = diagnostics_of(&generated);
    assert!(found.is_empty(), "the generated document:\n{}", found.join("\n"));
}

/// The committed document with `change` applied: its diagnostics, which must name `expected`.
#[track_caller]
fn assert_invalid(what: &str, change: impl FnOnce(&mut Value), expected: &str) {
    let mut document = committed();
    change(&mut document);
    let found = diagnostics_of(&document);
    assert!(
        found.iter().any(|d| d.contains(expected)),
        "{what}: expected a diagnostic with `{expected}`, got {found:#?}"
    );
}

/// The name of a channel whose address has a `{parameter}`, and that parameter's name.
fn parameterized_channel(document: &Value) -> (String, String) {
    let channels = document["channels"].as_object().unwrap();
    channels
        .iter()
        .find_map(|(name, channel)| {
            let parameter = channel.get("parameters")?.as_object()?.keys().next()?;
            Some((name.clone(), parameter.clone()))
        })
        .expect("a channel with a parameter")
}

/// The name of an operation, and its channel's name.
fn an_operation(document: &Value) -> (String, String) {
    let (name, operation) = document["operations"].as_object().unwrap().iter().next().unwrap();
    let channel = operation["channel"]["$ref"].as_str().unwrap();
    (name.clone(), channel.strip_prefix("#/channels/").unwrap().to_owned())
}

#[test]
fn the_validator_reports_a_broken_document() {
    let document = committed();
    assert!(diagnostics_of(&document).is_empty(), "the unchanged document is valid");

    let (channel, parameter) = parameterized_channel(&document);
    assert_invalid(
        "an address naming an undeclared parameter",
        |d| {
            let address = d["channels"][&channel]["address"].as_str().unwrap();
            let broken = address.replace(&format!("{{{parameter}}}"), "{undeclared}");
            d["channels"][&channel]["address"] = json!(broken);
        },
        "`{undeclared}` in `address` is not declared in `parameters`",
    );
    assert_invalid(
        "a channel's address without its parameter",
        |d| d["channels"][&channel]["address"] = json!("imagepipe.fixed"),
        &format!("`{parameter}` is declared but never used in `address`"),
    );
    assert_invalid("an empty address", |d| d["channels"][&channel]["address"] = json!(""), "must not be empty");

    let (operation, its_channel) = an_operation(&document);
    assert_invalid(
        "an operation's channel pointing at no channel",
        |d| d["operations"][&operation]["channel"]["$ref"] = json!("#/channels/nowhere"),
        "#/channels/nowhere",
    );
    assert_invalid(
        "an operation's message of another channel",
        |d| {
            let other = d["channels"]
                .as_object()
                .unwrap()
                .iter()
                .find(|(name, _)| **name != its_channel)
                .map(|(name, channel)| {
                    let message = channel["messages"].as_object().unwrap().keys().next().unwrap();
                    format!("#/channels/{name}/messages/{message}")
                })
                .unwrap();
            d["operations"][&operation]["messages"] = json!([{ "$ref": other }]);
        },
        &format!("operations.{operation}"),
    );
    assert_invalid(
        "a message $ref pointing at no message",
        |d| {
            let messages = d["channels"][&its_channel]["messages"].as_object_mut().unwrap();
            let first = messages.keys().next().unwrap().clone();
            messages[&first] = json!({ "$ref": "#/components/messages/nothing" });
        },
        "#/components/messages/nothing",
    );
    assert_invalid(
        "no `asyncapi`",
        |d| {
            d.as_object_mut().unwrap().remove("asyncapi");
        },
        "missing field `asyncapi`",
    );
    assert_invalid("`asyncapi` 2.6.0", |d| d["asyncapi"] = json!("2.6.0"), "not an AsyncAPI 3.0 document");
    // A key the specification does not define (a misspelt `address`) is not read.
    let mut misspelt = document.clone();
    let channel_object = misspelt["channels"][&channel].as_object_mut().unwrap();
    let address = channel_object.remove("address").unwrap();
    channel_object.insert("adress".to_owned(), address);
    assert_eq!(unread(&misspelt), [format!("#/channels/{channel}/adress: dropped")]);
    assert!(unread(&document).is_empty());

    assert_invalid(
        "no `info`",
        |d| {
            d.as_object_mut().unwrap().remove("info");
        },
        "missing field `info`",
    );
}
