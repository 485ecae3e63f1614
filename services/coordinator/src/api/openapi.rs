//! The OpenAPI 3.1 document of the coordinator's API — its own routes and those it forwards
//! ([`forward`](super::forward)) — rendered from the route tables the routers are mounted from
//! ([`route`](super::route)), with schemas generated from the handlers' types (JSON Schema
//! 2020-12, as OpenAPI 3.1 takes it). Descriptions of the schemas come from doc comments, with
//! their rustdoc link syntax removed in one pass ([`plain_text`]).

use axum::Json;
use axum::response::IntoResponse;
use imagepipe_runtime::http::Scope::Read;
use schemars::generate::SchemaSettings;
use serde_json::{Map, Value, json};

use super::route::{Answer, Content, Operation, Route};
use super::{ApiState, operations};

/// The document's own route.
pub(super) fn routes() -> Vec<Route<ApiState>> {
    let operation = Operation::get("/v1/openapi.json", Read, "openapiDocument", "This document").answer(Answer::with(
        200,
        "OpenAPI 3.1",
        Content::any_object(),
    ));
    vec![Route::new(operation, serve)]
}

async fn serve() -> impl IntoResponse {
    Json(document())
}

/// The document served at `/v1/openapi.json`: every operation of [`operations`], each with the
/// answers any route may give (`401`, and `403` and `429` unless it says otherwise).
pub fn document() -> Value {
    let settings = SchemaSettings::draft2020_12().with(|s| {
        s.definitions_path = "/components/schemas".into();
        s.meta_schema = None;
    });
    let mut generator = settings.into_generator();
    let mut paths = Map::new();
    for operation in operations() {
        let path = operation.path;
        let (method, rendered) = with_common_answers(operation).render(&mut generator);
        let item = paths.entry(path).or_insert_with(|| json!({}));
        let previous = item.as_object_mut().expect("a path item").insert(method.clone(), rendered);
        assert!(previous.is_none(), "{method} {path} twice in the route tables");
    }
    let components = generator.take_definitions(true);
    let mut document = json!({
        "openapi": "3.1.0",
        "info": {
            "title": "imagepipe coordinator",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Submit image tasks, follow their state and history, watch events, manage dead letters; \
                            search, stats and similarity of the services the coordinator forwards them to. \
                            Every error is {\"error\": code, \"message\": ...}: an unknown route 404 not_found, \
                            a method a route does not take 405 method_not_allowed."
        },
        "components": {
            "schemas": components,
            "securitySchemes": { "bearer": { "type": "http", "scheme": "bearer" } }
        },
        "security": [{ "bearer": [] }],
        "paths": paths
    });
    strip_doc_links(&mut document);
    document
}

/// `operation` with the answers of the HTTP edge: `401` (always), `403` and `429` (unless it
/// has its own).
fn with_common_answers(operation: Operation) -> Operation {
    let forbidden = Answer::error(
        403,
        "The token's scope is below what the route needs (forbidden), a browser's cross-site request \
         (cross_origin) or a dashboard session without its CSRF token (csrf); without a token, a \
         loopback client naming another Host (forbidden_host)",
    );
    let throttled = Answer::error(
        429,
        "Too many wrong tokens from this client address within http.auth_failure_window \
         (http.auth_failure_limit); wait Retry-After seconds",
    )
    .header("Retry-After", json!({ "schema": { "type": "integer" } }));
    operation
        .error(401, "No or a wrong bearer token (with http.auth_token set)")
        .answer_unless_given(forbidden)
        .answer_unless_given(throttled)
}

/// Replaces every `description` in `value` by its [`plain_text`].
fn strip_doc_links(value: &mut Value) {
    match value {
        Value::Object(map) => {
            strip_description(map);
            map.values_mut().for_each(strip_doc_links);
        }
        Value::Array(items) => items.iter_mut().for_each(strip_doc_links),
        _ => {}
    }
}

fn strip_description(map: &mut Map<String, Value>) {
    if let Some(Value::String(text)) = map.get_mut("description") {
        *text = plain_text(text);
    }
}

/// `text` without rustdoc link syntax: `[Foo::bar]`, ``[`Foo`]``, `[text](target)` and
/// `[text][target]` become `Foo::bar`, `` `Foo` `` and `text`; brackets around anything that is
/// not a Rust path and not followed by a link target (`[A-Za-z0-9_.-]`) stay.
pub fn plain_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find('[') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let Some(close) = after.find(']') else {
            rest = &rest[open..];
            break;
        };
        let inner = &after[..close];
        let tail = &after[close + 1..];
        let target = link_target(tail);
        if target.is_some() || is_rust_path(inner.trim_matches('`')) {
            out.push_str(inner);
            rest = &tail[target.unwrap_or(0)..];
        } else {
            out.push('[');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// The length of a link target opening `tail`: `(target)` or `[target]` without spaces.
fn link_target(tail: &str) -> Option<usize> {
    let close = match tail.chars().next()? {
        '(' => ')',
        '[' => ']',
        _ => return None,
    };
    let end = tail.find(close)?;
    let target = &tail[1..end];
    (!target.is_empty() && !target.contains(char::is_whitespace)).then_some(end + 1)
}

/// Whether `s` is a Rust path such as `Foo`, `Foo::bar` or `Foo::bar()`.
fn is_rust_path(s: &str) -> bool {
    let s = s.strip_suffix("()").unwrap_or(s);
    !s.is_empty()
        && s.split("::").all(|part| {
            let mut chars = part.chars();
            chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::super::forward::Upstream;
    use super::super::{batch, blobs, json_routes};
    use super::*;

    /// Each route the routers mount — the coordinator's own ([`super::super::router`]) and the
    /// forwarded ones ([`Forwarding::router`](super::super::forward::Forwarding::router)) — from
    /// the same tables the document is rendered from: a route served without its operation in
    /// the document fails here.
    #[test]
    fn every_route_the_routers_mount_is_in_the_document() {
        let document = document();
        let mut mounted = BTreeSet::new();
        let own = json_routes().into_iter().chain(batch::routes()).map(|r| r.operation);
        let blobs = blobs::routes().into_iter().map(|r| r.operation);
        let forwarded = Upstream::ALL.into_iter().flat_map(Upstream::operations);
        for operation in own.chain(blobs).chain(forwarded) {
            let (method, path) = (operation.method.as_str().to_ascii_lowercase(), operation.path.to_owned());
            let documented = &document["paths"][&path][&method];
            assert_eq!(documented["operationId"], operation.id, "{method} {path} in the document");
            assert!(mounted.insert((method, path)), "{} mounted twice", operation.id);
        }
        let documented: BTreeSet<(String, String)> = document["paths"]
            .as_object()
            .unwrap()
            .iter()
            .flat_map(|(path, item)| item.as_object().unwrap().keys().map(|method| (method.clone(), path.clone())))
            .collect();
        assert_eq!(documented, mounted, "the document has exactly the mounted operations");
    }

    #[test]
    fn rustdoc_links_become_plain_text_and_other_brackets_stay() {
        let cases = [
            ("checked by [SubmitTask::validate].", "checked by SubmitTask::validate."),
            ("see [`Task`] and [`auth`](super::auth)", "see `Task` and `auth`"),
            ("the [store][crate::store] keeps it", "the store keeps it"),
            ("1 to 128 characters of [A-Za-z0-9_.-]", "1 to 128 characters of [A-Za-z0-9_.-]"),
            ("a list [a, b] and [open", "a list [a, b] and [open"),
            ("[Engine::submit()] first", "Engine::submit() first"),
        ];
        for (text, plain) in cases {
            assert_eq!(plain_text(text), plain, "{text}");
        }
    }

    #[test]
    fn the_document_has_no_rustdoc_links_and_no_duplicate_schema_names() {
        let document = document();
        let text = serde_json::to_string(&document).unwrap();
        for link in ["[SubmitTask::validate]", "[`", "](", "]["] {
            assert!(!text.contains(link), "{link} in the document");
        }
        let names: Vec<&String> = document["components"]["schemas"].as_object().unwrap().keys().collect();
        let numbered: Vec<&&String> = names.iter().filter(|n| n.ends_with(|c: char| c.is_ascii_digit())).collect();
        assert!(numbered.is_empty(), "schemars numbered clashing type names: {numbered:?}");
    }

    #[test]
    fn every_operation_has_its_own_id_and_links_name_existing_operations() {
        let document = document();
        let mut ids = BTreeSet::new();
        let mut linked = Vec::new();
        for (path, operations) in document["paths"].as_object().unwrap() {
            for (method, operation) in operations.as_object().unwrap() {
                let id = operation["operationId"].as_str().unwrap_or_else(|| panic!("{method} {path}: no operationId"));
                assert!(ids.insert(id.to_owned()), "{id} twice");
                for status in ["401", "403", "429"] {
                    assert!(operation["responses"].get(status).is_some(), "{method} {path}: {status}");
                }
                for response in operation["responses"].as_object().unwrap().values() {
                    if let Some(links) = response.get("links").and_then(Value::as_object) {
                        linked.extend(links.values().map(|l| l["operationId"].as_str().unwrap().to_owned()));
                    }
                }
            }
        }
        assert!(!linked.is_empty());
        for id in linked {
            assert!(ids.contains(&id), "a link names {id}, which is no operation");
        }
    }

    #[test]
    fn every_forwarded_route_is_documented_with_its_gateway_errors() {
        let document = document();
        for upstream in Upstream::ALL {
            for forwarded in upstream.operations() {
                let (path, method) = (forwarded.path, forwarded.method.as_str().to_ascii_lowercase());
                let operation = &document["paths"][path][&method];
                let responses = operation["responses"].as_object().unwrap_or_else(|| panic!("{method} {path}"));
                assert!(responses.keys().any(|s| s.starts_with('2')), "{method} {path}: a success");
                for status in ["404", "502", "504"] {
                    assert!(responses.get(status).is_some(), "{method} {path}: {status}");
                }
                assert!(operation["description"].as_str().unwrap().contains(upstream.key()), "{path}");
            }
        }
        let search = &document["paths"]["/v1/search"]["get"]["responses"]["200"]["content"]["application/json"];
        assert_eq!(search["schema"]["$ref"], "#/components/schemas/SearchResponse");
    }
}
