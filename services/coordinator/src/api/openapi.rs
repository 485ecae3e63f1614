//! The OpenAPI 3.1 document of the API, with schemas generated from the handlers' types.

use schemars::generate::SchemaSettings;
use serde_json::{Value, json};

use super::blobs::Uploaded;
use super::{Accepted, ApiError, CancelRequest, History, Replayed, TaskView};
use crate::store::{DeadLetterPage, TaskPage};
use imagepipe_contracts::SubmitTask;

/// The document served at `/v1/openapi.json`.
pub fn document() -> Value {
    let mut generator = SchemaSettings::openapi3().into_generator();
    let refs = [
        ("SubmitTask", generator.subschema_for::<SubmitTask>()),
        ("Accepted", generator.subschema_for::<Accepted>()),
        ("TaskView", generator.subschema_for::<TaskView>()),
        ("TaskPage", generator.subschema_for::<TaskPage>()),
        ("History", generator.subschema_for::<History>()),
        ("CancelRequest", generator.subschema_for::<CancelRequest>()),
        ("DeadLetterPage", generator.subschema_for::<DeadLetterPage>()),
        ("Replayed", generator.subschema_for::<Replayed>()),
        ("Uploaded", generator.subschema_for::<Uploaded>()),
        ("Error", generator.subschema_for::<ApiError>()),
    ];
    let schema = |name: &str| {
        let s = refs.iter().find(|(n, _)| *n == name).map(|(_, s)| s.clone()).expect("known schema");
        serde_json::to_value(s).expect("schemas serialize")
    };
    let components = generator.take_definitions(true);
    let json_body = |name: &str| json!({ "content": { "application/json": { "schema": schema(name) } } });
    let error = |description: &str| json!({ "description": description, "content": { "application/json": { "schema": schema("Error") } } });
    let id_param = |what: &str| json!({ "name": "id", "in": "path", "required": true, "schema": { "type": "string" }, "description": what });
    let query = |name: &str, description: &str| json!({ "name": name, "in": "query", "required": false, "schema": { "type": "string" }, "description": description });
    let ok = |description: &str, name: &str| {
        let mut body = json_body(name);
        body["description"] = json!(description);
        body
    };
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "imagepipe coordinator",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Submit image tasks, follow their state and history, watch events, manage dead letters."
        },
        "components": {
            "schemas": components,
            "securitySchemes": { "bearer": { "type": "http", "scheme": "bearer" } }
        },
        "security": [{ "bearer": [] }],
        "paths": {
            "/v1/tasks": {
                "post": {
                    "summary": "Submit a task",
                    "requestBody": { "required": true, "content": json_body("SubmitTask")["content"].clone() },
                    "responses": {
                        "202": {
                            "description": "Accepted (or the existing task of this id or idempotency key)",
                            "headers": { "Location": { "schema": { "type": "string" }, "description": "The task's URL" } },
                            "content": json_body("Accepted")["content"].clone()
                        },
                        "400": error("Malformed JSON, a wrong field type, or a submit that breaks a rule (the message names it)"),
                        "401": error("Missing or wrong bearer token")
                    }
                },
                "get": {
                    "summary": "A page of tasks, oldest first",
                    "parameters": [
                        query("status", "queued | downloading | extracting_metadata | analyzing | completed | failed | cancelled"),
                        query("limit", "1 to 500, default 50"),
                        query("cursor", "nextCursor of the previous page")
                    ],
                    "responses": { "200": ok("A page", "TaskPage"), "400": error("A bad parameter") }
                }
            },
            "/v1/tasks/{id}": {
                "get": {
                    "summary": "A task: state, each step's output and attempts, last error",
                    "parameters": [id_param("Task id")],
                    "responses": { "200": ok("The task", "TaskView"), "404": error("No such task") }
                }
            },
            "/v1/tasks/{id}/history": {
                "get": {
                    "summary": "Every transition of a task with its time",
                    "parameters": [id_param("Task id")],
                    "responses": { "200": ok("The history", "History"), "404": error("No such task") }
                }
            },
            "/v1/tasks/{id}/cancel": {
                "post": {
                    "summary": "Cancel a task; it stops at the next step boundary",
                    "parameters": [id_param("Task id")],
                    "requestBody": { "required": false, "content": json_body("CancelRequest")["content"].clone() },
                    "responses": {
                        "202": ok("Cancelled, or cancelling at the step boundary", "TaskView"),
                        "404": error("No such task"),
                        "409": error("The task already finished")
                    }
                }
            },
            "/v1/events": {
                "get": {
                    "summary": "Server-Sent Events of the event topics (each `data` is an event envelope)",
                    "parameters": [
                        query("taskId", "Only events of this task"),
                        query("type", "Event type selector, e.g. `task.completed || task.failed` or `image.*`")
                    ],
                    "responses": {
                        "200": { "description": "An event stream", "content": { "text/event-stream": { "schema": { "type": "string" } } } },
                        "400": error("A bad parameter")
                    }
                }
            },
            "/v1/dlq": {
                "get": {
                    "summary": "Dead letters, oldest first",
                    "parameters": [query("limit", "1 to 500, default 50"), query("cursor", "nextCursor of the previous page")],
                    "responses": { "200": ok("A page", "DeadLetterPage"), "400": error("A bad parameter") }
                }
            },
            "/v1/dlq/{id}": {
                "delete": {
                    "summary": "Purge a dead letter",
                    "parameters": [id_param("Dead letter id")],
                    "responses": { "204": { "description": "Purged" }, "404": error("No such dead letter") }
                }
            },
            "/v1/dlq/{id}/replay": {
                "post": {
                    "summary": "Send a dead letter back to its queue and remove it",
                    "parameters": [id_param("Dead letter id")],
                    "responses": {
                        "202": ok("Replayed", "Replayed"),
                        "404": error("No such dead letter"),
                        "409": error("Its source is not a task queue")
                    }
                }
            },
            "/v1/blobs": {
                "post": {
                    "summary": "Upload an image; submit its key as {\"blob\": key}",
                    "requestBody": { "required": true, "content": { "application/octet-stream": { "schema": { "type": "string", "format": "binary" } } } },
                    "responses": {
                        "201": ok("Stored (or already stored: keys are content addresses)", "Uploaded"),
                        "400": error("An empty body"),
                        "413": { "description": "Larger than download.max_bytes" },
                        "415": error("The bytes are not an image (the message says what they look like)")
                    }
                }
            },
            "/v1/blobs/{key}": {
                "get": {
                    "summary": "An image or thumbnail by key",
                    "parameters": [{ "name": "key", "in": "path", "required": true, "schema": { "type": "string" }, "description": "sha256:<hex>" }],
                    "responses": {
                        "200": { "description": "The bytes, typed by their magic numbers", "content": { "image/*": { "schema": { "type": "string", "format": "binary" } } } },
                        "400": error("Not a blob key"),
                        "404": error("No such blob")
                    }
                }
            },
            "/v1/openapi.json": {
                "get": { "summary": "This document", "responses": { "200": { "description": "OpenAPI 3.1" } } }
            }
        }
    })
}
