//! The AsyncAPI 3.0 document of imagepipe's messaging, generated from the types like the JSON
//! Schemas of [`crate::schema`]: every channel (the task queues, the step results, the event
//! subjects and topics, the dead-letter queues) with its messages, each message's payload the
//! JSON Schema of its type and its headers the CloudEvents attributes ([`crate::cloudevents`])
//! and imagepipe's own headers, on both servers (NATS JetStream and Kafka).
//!
//! The committed copy is `docs/asyncapi.yaml`; a test fails when it drifts from the types
//! (regenerate with `IMAGEPIPE_UPDATE_SCHEMAS=1 cargo test -p imagepipe-contracts --test asyncapi`).
//! Addresses carry the default `bus.prefix`, `imagepipe`.

use serde_json::{Map, Value, json};

use crate::cloudevents::{CommandType, DATA_CONTENT_TYPE, SOURCE_PREFIX, SPEC_VERSION};
use crate::names::{self, headers};
use crate::{EventType, SCHEMA_VERSION, Step};

/// The bus prefix the addresses of the document carry (`bus.prefix`'s default).
pub const PREFIX: &str = "imagepipe";

/// The JSON Schemas could not be gathered into one document.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AsyncApiError {
    /// Two schemas define a type of the same name differently.
    #[error("schema `{name}` is defined differently by {first} and {second}")]
    Clash {
        /// The component name.
        name: String,
        /// The schema file that defined it first.
        first: String,
        /// The schema file that defines it again, differently.
        second: String,
    },
    /// A schema file that the document needs is not among [`crate::schema::all`].
    #[error("no JSON Schema {0} among crate::schema::all()")]
    MissingSchema(String),
}

/// The component name of the schema in file `file` of [`crate::schema::all`]:
/// `submit-task.schema.json` → `SubmitTask`, `payload/image.downloaded.schema.json` →
/// `ImageDownloadedPayload`, `event.schema.json` → `Event`.
pub fn schema_name(file: &str) -> String {
    let (stem, suffix) = match file.strip_prefix("payload/") {
        Some(rest) => (rest, "Payload"),
        None => (file, ""),
    };
    let stem = stem.strip_suffix(".schema.json").unwrap_or(stem);
    let mut name: String = stem
        .split(['-', '.', '_'])
        .map(|word| {
            let mut chars = word.chars();
            chars.next().map(|c| c.to_ascii_uppercase().to_string() + chars.as_str()).unwrap_or_default()
        })
        .collect();
    name.push_str(suffix);
    name
}

/// `#/components/schemas/<name>`.
fn schema_ref(name: &str) -> Value {
    json!({ "$ref": format!("#/components/schemas/{name}") })
}

/// Every schema of [`crate::schema::all`] as AsyncAPI components: each root under
/// [`schema_name`], its `$defs` lifted beside it (their `$ref`s rewritten to
/// `#/components/schemas/...`), `$schema` left out (the document's schema format is
/// AsyncAPI's JSON Schema).
fn component_schemas() -> Result<Map<String, Value>, AsyncApiError> {
    let mut out = Map::new();
    let mut origin: Map<String, Value> = Map::new();
    let mut add = |name: String, schema: Value, file: &str| -> Result<(), AsyncApiError> {
        if let Some(existing) = out.get(&name) {
            if *existing != schema {
                return Err(AsyncApiError::Clash {
                    name: name.clone(),
                    first: origin[&name].as_str().unwrap_or_default().to_owned(),
                    second: file.to_owned(),
                });
            }
            return Ok(());
        }
        origin.insert(name.clone(), Value::from(file));
        out.insert(name, schema);
        Ok(())
    };
    for (file, schema) in crate::schema::all() {
        let mut schema = serde_json::to_value(schema).expect("schemas serialize");
        rewrite_refs(&mut schema);
        let object = schema.as_object_mut().expect("every schema is an object");
        object.remove("$schema");
        if let Some(Value::Object(defs)) = object.remove("$defs") {
            for (name, def) in defs {
                add(name, def, &file)?;
            }
        }
        add(schema_name(&file), schema, &file)?;
    }
    Ok(out)
}

/// Rewrites every `#/$defs/X` reference under `value` to `#/components/schemas/X`.
fn rewrite_refs(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (key, child) in map.iter_mut() {
                if key == "$ref"
                    && let Value::String(target) = child
                    && let Some(name) = target.strip_prefix("#/$defs/")
                {
                    *target = format!("#/components/schemas/{name}");
                } else {
                    rewrite_refs(child);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(rewrite_refs),
        _ => {}
    }
}

/// A header whose value is a string matching `constraint` (a JSON Schema fragment).
fn header(description: &str, constraint: Value) -> Value {
    let mut schema = json!({ "type": "string", "description": description });
    if let (Value::Object(schema), Value::Object(extra)) = (&mut schema, constraint) {
        schema.extend(extra);
    }
    schema
}

/// The CloudEvents attribute headers of a message of `ce_type`, under the names of one
/// binding (`prefix` `ce_` for Kafka, `ce-` for NATS), all required when `required`.
fn cloud_event_headers(prefix: &str, ce_type: &str, required: bool) -> Value {
    let mut properties = Map::new();
    let mut names = Vec::new();
    let mut attribute = |attribute: &str, schema: Value| {
        let name = format!("{prefix}{attribute}");
        names.push(Value::from(name.clone()));
        properties.insert(name, schema);
    };
    attribute("id", header("CloudEvents `id`: the event id, or the command's message id.", json!({ "minLength": 1 })));
    attribute(
        "source",
        header(
            "CloudEvents `source`: `/imagepipe/` and the sending service.",
            json!({ "pattern": format!("^{SOURCE_PREFIX}[^/]+$") }),
        ),
    );
    attribute("specversion", header("CloudEvents `specversion`.", json!({ "const": SPEC_VERSION })));
    attribute("type", header("CloudEvents `type`.", json!({ "const": ce_type })));
    attribute(
        "time",
        header(
            "CloudEvents `time`: the event's `timestamp` (a command's send time), RFC 3339 in UTC.",
            json!({ "format": "date-time" }),
        ),
    );
    let mut schema = json!({ "type": "object", "properties": properties });
    if required {
        schema["required"] = Value::Array(names);
    }
    schema
}

/// The `headers` schema of a message of CloudEvents type `ce_type`: the CloudEvents
/// attributes under the Kafka binding's names or the NATS binding's (exactly one set),
/// `content-type`, the subject when `with_subject`, and imagepipe's `extra` headers (name,
/// schema, required). A submit's attributes are optional (a client sends its own, or none).
fn message_headers(
    ce_type: &str,
    attributes_required: bool,
    with_subject: bool,
    extra: &[(&str, Value, bool)],
) -> Value {
    let mut properties = Map::new();
    let mut required = Vec::new();
    properties.insert(
        headers::CONTENT_TYPE.to_owned(),
        header("The body's media type, the CloudEvents `datacontenttype`.", json!({ "const": DATA_CONTENT_TYPE })),
    );
    properties.insert(
        "ce-datacontenttype".to_owned(),
        header("NATS only: `datacontenttype` under the NATS binding's name.", json!({ "const": DATA_CONTENT_TYPE })),
    );
    if attributes_required {
        required.push(Value::from(headers::CONTENT_TYPE));
    }
    for prefix in ["ce_", "ce-"] {
        properties.insert(
            format!("{prefix}subject"),
            header("CloudEvents `subject`: the task id.", json!({ "minLength": 1 })),
        );
    }
    for (name, schema, is_required) in extra {
        properties.insert((*name).to_owned(), schema.clone());
        if *is_required {
            required.push(Value::from(*name));
        }
    }
    let kafka = cloud_event_headers("ce_", ce_type, attributes_required);
    let nats = cloud_event_headers("ce-", ce_type, attributes_required);
    let mut bindings = vec![kafka, nats];
    if attributes_required && with_subject {
        bindings[0]["required"].as_array_mut().expect("required").push("ce_subject".into());
        bindings[1]["required"].as_array_mut().expect("required").push("ce-subject".into());
    }
    let mut schema = json!({
        "type": "object",
        "description": "CloudEvents 1.0 attributes in binary content mode: `ce_*` on Kafka (Kafka protocol binding), \
                        `ce-*` on NATS (NATS protocol binding, values percent-encoded), and imagepipe's headers.",
        "properties": properties,
    });
    if attributes_required {
        schema["oneOf"] = Value::Array(bindings);
        schema["required"] = Value::Array(required);
    } else {
        schema["allOf"] = Value::Array(bindings);
        if !required.is_empty() {
            schema["required"] = Value::Array(required);
        }
    }
    schema
}

/// imagepipe's own headers on every message it sends: (name, schema, required).
fn common_headers() -> Vec<(&'static str, Value, bool)> {
    vec![
        (
            headers::TRACEPARENT,
            header(
                "W3C trace context of the task's trace: always from the coordinator, from a worker or \
                 subscriber when it is traced.",
                json!({ "pattern": "^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$" }),
            ),
            false,
        ),
        (headers::SCHEMA, header("Schema version of the body.", json!({ "const": SCHEMA_VERSION })), true),
        (
            headers::MESSAGE_ID,
            header("Kafka: the message id (publish deduplication; `Nats-Msg-Id` on NATS).", json!({})),
            false,
        ),
    ]
}

/// The headers a dead letter carries besides the original message's.
fn dead_letter_headers() -> Vec<(&'static str, Value, bool)> {
    vec![
        (headers::DLQ_REASON, header("Why it was dead-lettered.", json!({})), true),
        (
            headers::DLQ_DELIVERY_COUNT,
            header("How many times it had been delivered.", json!({ "pattern": "^[0-9]+$" })),
            true,
        ),
        (headers::DLQ_SOURCE, header("The queue or subscriber group it was taken from.", json!({})), true),
        (
            headers::DLQ_TIMESTAMP,
            header("Unix milliseconds when it was dead-lettered.", json!({ "pattern": "^[0-9]+$" })),
            true,
        ),
    ]
}

/// The message component of the task-queue message of `command_type`.
fn command_message(command_type: CommandType) -> (String, Value) {
    let (name, title, schema, summary) = match command_type {
        CommandType::Submit => {
            ("submitTask", "Submit command", "SubmitTask", "A new task: the image's URL or uploaded blob, and options.")
        }
        CommandType::Download => (
            "downloadCommand",
            "Download command",
            "DownloadCommand",
            "Fetch a task's source image into the blob store.",
        ),
        CommandType::Metadata => (
            "metadataCommand",
            "Metadata command",
            "MetadataCommand",
            "Decode the image, extract metadata, write thumbnails.",
        ),
        CommandType::Analyze => {
            ("analyzeCommand", "Analyze command", "AnalyzeCommand", "Label the image with the model.")
        }
        CommandType::StepResult => {
            ("stepResult", "Step result", "StepResult", "A worker's report on one attempt of one step.")
        }
        CommandType::Stage => (
            "stageCommand",
            "Stage command",
            "StageCommand",
            "Run one attempt of a stage of users' own (`pipeline.stages`) for one task.",
        ),
    };
    let is_submit = command_type == CommandType::Submit;
    let mut extra = if is_submit { Vec::new() } else { common_headers() };
    if matches!(command_type, CommandType::Download | CommandType::Metadata | CommandType::Analyze | CommandType::Stage)
    {
        extra.push((
            headers::SHARD,
            header(
                "The task's shard: the partition of `tasks.results` its result goes to.",
                json!({ "pattern": "^[0-9]+$" }),
            ),
            false,
        ));
    }
    let message = json!({
        "name": command_type.as_str(),
        "title": title,
        "summary": summary,
        "contentType": DATA_CONTENT_TYPE,
        "headers": message_headers(command_type.as_str(), !is_submit, true, &extra),
        "payload": schema_ref(schema),
    });
    (name.to_owned(), message)
}

/// The message component name of events of `event_type` (`image.downloaded` →
/// `event.image.downloaded`).
fn event_message_name(event_type: EventType) -> String {
    format!("event.{event_type}")
}

/// The message component of events of `event_type`: the envelope with its typed payload.
fn event_message(event_type: EventType) -> Value {
    let payload = schema_name(&format!("payload/{event_type}.schema.json"));
    // queue.* events have no task, so no subject.
    let with_subject = !event_type.as_str().starts_with("queue.");
    let mut extra = common_headers();
    extra.push((
        headers::EVENT_TYPE,
        header("The event type, so a subscriber skips without parsing.", json!({ "const": event_type.as_str() })),
        true,
    ));
    json!({
        "name": event_type.as_str(),
        "title": event_type.as_str(),
        "summary": format!("The `{event_type}` event in the envelope."),
        "contentType": DATA_CONTENT_TYPE,
        "headers": message_headers(event_type.as_str(), true, with_subject, &extra),
        "payload": {
            "allOf": [
                schema_ref("Event"),
                {
                    "type": "object",
                    "properties": {
                        "eventType": { "const": event_type.as_str() },
                        "payload": schema_ref(&payload),
                    },
                },
            ],
        },
    })
}

/// `<prefix>.<name>`.
fn address(name: &str) -> String {
    format!("{PREFIX}.{name}")
}

/// A channel id from a logical name (`tasks.download` → `tasks_download`, `tasks.{stage}` →
/// `tasks_stage`).
fn channel_id(name: &str) -> String {
    name.replace('.', "_").replace(['{', '}'], "")
}

/// The message reference of component message `name`.
fn message_ref(name: &str) -> Value {
    json!({ "$ref": format!("#/components/messages/{name}") })
}

/// The AsyncAPI 3.0 document (see the module docs), as a JSON value in the order it is
/// written.
pub fn document() -> Result<Value, AsyncApiError> {
    let schemas = component_schemas()?;
    for needed in ["Event", "SubmitTask", "DownloadCommand", "MetadataCommand", "AnalyzeCommand", "StepResult"] {
        if !schemas.contains_key(needed) {
            return Err(AsyncApiError::MissingSchema(needed.to_owned()));
        }
    }
    let mut messages = Map::new();
    let mut channels = Map::new();
    let mut operations = Map::new();
    let lanes = |queue: &str| {
        format!(
            "Priority lanes: `{p}.{queue}` carries `normal`, `{p}.{queue}.high` and `{p}.{queue}.low` the others \
             (same messages).",
            p = PREFIX
        )
    };

    // Task queues, in pipeline order, then the queue of each stage of users' own.
    for command_type in CommandType::ALL.into_iter().chain([CommandType::Stage]) {
        let (name, message) = command_message(command_type);
        messages.insert(name.clone(), message);
        let queue = command_type.queue();
        let (description, consumer) = match command_type {
            CommandType::Submit => (
                "Task submissions (plain JSON, the same on every path). Partitioned: `<address>.<shard>` on NATS, \
                 Kafka partition `<shard>` (docs/contracts.md, \"Shards\").",
                "the coordinator",
            ),
            CommandType::Download => ("ImageDownloadQueue.", "download-worker replicas (competing)"),
            CommandType::Metadata => ("MetadataProcessingQueue.", "metadata-worker replicas (competing)"),
            CommandType::Analyze => ("AIProcessingQueue.", "ai-worker replicas (competing)"),
            CommandType::Stage => (
                "The queue of each stage of users' own: `{stage}` is its name in `pipeline.stages`.",
                "that stage's worker replicas (competing; any language)",
            ),
            CommandType::StepResult => (
                "Step results. Partitioned like the submissions: a worker sends its result to the partition its \
                 command's `imagepipe-shard` header names.",
                "the coordinator",
            ),
        };
        let id = channel_id(queue);
        let mut channel = json!({
            "address": address(queue),
            "title": queue,
            "description": format!("{description} Consumed by {consumer}. {}", lanes(queue)),
            "messages": { name.clone(): message_ref(&name) },
        });
        if command_type == CommandType::Stage {
            channel["parameters"] = json!({
                "stage": { "description": "The stage's name in `pipeline.stages` (1 to 32 lowercase letters, digits or `_`, starting with a letter)." }
            });
        }
        channels.insert(id.clone(), channel);
        let (action, verb) = match command_type {
            CommandType::Submit => ("receive", "receive"),
            _ => ("send", "send"),
        };
        operations.insert(
            format!("{verb}_{id}"),
            json!({
                "action": action,
                "channel": { "$ref": format!("#/channels/{id}") },
                "summary": match command_type {
                    CommandType::Submit => "imagepipe takes task submissions.".to_owned(),
                    CommandType::StepResult => "Workers report step results to the coordinator.".to_owned(),
                    other => format!("The coordinator sends {} commands.", other.as_str().trim_start_matches("command.")),
                },
                "messages": [{ "$ref": format!("#/channels/{id}/messages/{name}") }],
            }),
        );
    }

    // Events: one NATS subject per event type, one Kafka topic per family.
    for event_type in EventType::ALL {
        let name = event_message_name(event_type);
        messages.insert(name.clone(), event_message(event_type));
        let id = channel_id(&format!("{}.{event_type}", names::topics::EVENTS));
        channels.insert(
            id.clone(),
            json!({
                "address": address(&format!("{}.{event_type}", names::topics::EVENTS)),
                "title": format!("{event_type} (NATS subject)"),
                "description": format!(
                    "NATS: every `{event_type}` event; every subscriber group gets each (a durable consumer per group)."
                ),
                "servers": [{ "$ref": "#/servers/nats" }],
                "messages": { name.clone(): message_ref(&name) },
            }),
        );
        operations.insert(
            format!("publish_{id}"),
            json!({
                "action": "send",
                "channel": { "$ref": format!("#/channels/{id}") },
                "summary": format!("imagepipe publishes `{event_type}`."),
                "messages": [{ "$ref": format!("#/channels/{id}/messages/{name}") }],
            }),
        );
    }
    for (topic, title) in [
        (names::topics::IMAGE_EVENTS, "ImageEventsQueue"),
        (names::topics::TASK_EVENTS, "TaskLifecycleEventsQueue"),
        (names::topics::STAGE_EVENTS, "StageEventsQueue"),
    ] {
        let id = channel_id(topic);
        let members: Vec<EventType> =
            EventType::ALL.into_iter().filter(|t| names::topic_of_event_type(t.as_str()) == topic).collect();
        let channel_messages: Map<String, Value> =
            members.iter().map(|t| (event_message_name(*t), message_ref(&event_message_name(*t)))).collect();
        channels.insert(
            id.clone(),
            json!({
                "address": address(topic),
                "title": format!("{title} (Kafka topic)"),
                "description": "Kafka: the events of this family, keyed by task id; every subscriber group (a consumer \
                                group) gets each. The `imagepipe-event-type` header names the type.",
                "servers": [{ "$ref": "#/servers/kafka" }],
                "messages": channel_messages,
            }),
        );
        operations.insert(
            format!("publish_{id}"),
            json!({
                "action": "send",
                "channel": { "$ref": format!("#/channels/{id}") },
                "summary": format!("imagepipe publishes the {title} events."),
                "messages": members
                    .iter()
                    .map(|t| json!({ "$ref": format!("#/channels/{id}/messages/{}", event_message_name(*t)) }))
                    .collect::<Vec<_>>(),
            }),
        );
    }

    // Dead letters: the original message, with the dead-letter headers.
    for command_type in CommandType::ALL {
        let (name, mut message) = command_message(command_type);
        let dead_name = format!("deadLetter.{name}");
        let mut extra = dead_letter_headers();
        if command_type != CommandType::Submit {
            extra.extend(common_headers());
        }
        message["name"] = Value::from(format!("dead-letter {}", command_type.as_str()));
        message["title"] = Value::from(format!("Dead letter: {}", message["title"].as_str().unwrap_or_default()));
        message["summary"] =
            Value::from("The message as it was sent, with why and when it was dead-lettered (malformed bodies too).");
        message["headers"] = message_headers(command_type.as_str(), false, true, &extra);
        messages.insert(dead_name.clone(), message);
        let dlq = names::dead_letter_queue(command_type.queue());
        let id = channel_id(&dlq);
        channels.insert(
            id.clone(),
            json!({
                "address": address(&dlq),
                "title": dlq.clone(),
                "description": format!(
                    "Dead letters of `{}` and its lanes: inspected and replayed with `imagepipe dlq list / replay`.",
                    command_type.queue()
                ),
                "messages": { dead_name.clone(): message_ref(&dead_name) },
            }),
        );
        operations.insert(
            format!("deadLetter_{}", channel_id(command_type.queue())),
            json!({
                "action": "send",
                "channel": { "$ref": format!("#/channels/{id}") },
                "summary": "A message that kept failing, or is malformed, is dead-lettered.",
                "messages": [{ "$ref": format!("#/channels/{id}/messages/{dead_name}") }],
            }),
        );
    }
    let mut dead_event = Map::new();
    dead_event.insert("name".into(), Value::from("dead-letter event"));
    dead_event.insert("title".into(), Value::from("Dead letter: event"));
    dead_event.insert(
        "summary".into(),
        Value::from("An event a subscriber group could not handle, as it was published, with the dead-letter headers."),
    );
    dead_event.insert("contentType".into(), Value::from(DATA_CONTENT_TYPE));
    let mut extra = dead_letter_headers();
    extra.extend(common_headers());
    let mut dead_headers = message_headers("image.downloaded", false, true, &extra);
    for binding in dead_headers["allOf"].as_array_mut().expect("allOf") {
        for prefix in ["ce_", "ce-"] {
            if let Some(type_header) = binding["properties"].get_mut(format!("{prefix}type")) {
                type_header.as_object_mut().expect("object").remove("const");
                type_header["description"] = Value::from("CloudEvents `type`: the event type.");
            }
        }
    }
    dead_event.insert("headers".into(), dead_headers);
    dead_event.insert("payload".into(), schema_ref("Event"));
    messages.insert("deadLetter.event".into(), Value::Object(dead_event));
    let group_dlq = names::dead_letter_queue_of_group("{group}");
    channels.insert(
        "dlq_events_group".into(),
        json!({
            "address": address(&group_dlq),
            "title": group_dlq.clone(),
            "description": "Dead letters of one event subscriber group.",
            "parameters": { "group": { "description": "The subscriber group, e.g. `analytics`." } },
            "messages": { "deadLetter.event": message_ref("deadLetter.event") },
        }),
    );
    operations.insert(
        "deadLetter_events".into(),
        json!({
            "action": "send",
            "channel": { "$ref": "#/channels/dlq_events_group" },
            "summary": "An event a subscriber group could not handle is dead-lettered in the group's queue.",
            "messages": [{ "$ref": "#/channels/dlq_events_group/messages/deadLetter.event" }],
        }),
    );

    let steps: Vec<&str> = Step::ALL.iter().map(|s| s.as_str()).collect();
    Ok(json!({
        "asyncapi": "3.0.0",
        "info": {
            "title": "imagepipe",
            "version": env!("CARGO_PKG_VERSION"),
            "description": format!(
                "The messages imagepipe's services exchange over NATS JetStream or Kafka (docs/design.md, \
                 docs/contracts.md). Generated from the types in shared/contracts; do not edit by hand.\n\n\
                 Every message is JSON and carries the CloudEvents 1.0 attributes in binary content mode as \
                 headers (`ce_*` on Kafka, `ce-*` on NATS); the body is the message itself. Addresses carry the \
                 default `bus.prefix` `{PREFIX}`. Steps, in order: {}.",
                steps.join(", ")
            ),
            "license": { "name": "Apache-2.0", "url": "https://www.apache.org/licenses/LICENSE-2.0" },
        },
        "defaultContentType": DATA_CONTENT_TYPE,
        "servers": {
            "nats": {
                "host": "127.0.0.1:4222",
                "protocol": "nats",
                "description": "NATS JetStream (`bus.kind = nats`, `bus.nats.url`): a work-queue stream for the \
                                task queues, a limits stream for the events, one for the dead letters.",
            },
            "kafka": {
                "host": "127.0.0.1:9092",
                "protocol": "kafka",
                "description": "Kafka (`bus.kind = kafka`, `bus.kafka.brokers`): one topic per channel, keyed by \
                                task id; a consumer group per worker kind or subscriber group.",
            },
        },
        "channels": channels,
        "operations": operations,
        "components": {
            "schemas": schemas,
            "messages": messages,
        },
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::queues;

    #[test]
    fn schema_names_follow_the_files() {
        assert_eq!(schema_name("submit-task.schema.json"), "SubmitTask");
        assert_eq!(schema_name("event.schema.json"), "Event");
        assert_eq!(schema_name("payload/image.metadata_extracted.schema.json"), "ImageMetadataExtractedPayload");
    }

    #[test]
    fn refs_point_into_the_components() {
        let doc = document().unwrap();
        let text = doc.to_string();
        assert!(!text.contains("#/$defs/"), "a $defs reference is left");
        // Every reference resolves.
        fn each_ref(value: &Value, out: &mut Vec<String>) {
            match value {
                Value::Object(map) => {
                    for (key, child) in map {
                        match (key.as_str(), child) {
                            ("$ref", Value::String(target)) => out.push(target.clone()),
                            _ => each_ref(child, out),
                        }
                    }
                }
                Value::Array(items) => items.iter().for_each(|item| each_ref(item, out)),
                _ => {}
            }
        }
        let mut refs = Vec::new();
        each_ref(&doc, &mut refs);
        assert!(refs.len() > 50);
        for target in refs {
            let pointer = target.strip_prefix('#').unwrap_or_else(|| panic!("external reference {target}"));
            assert!(doc.pointer(pointer).is_some(), "{target} does not resolve");
        }
    }

    #[test]
    fn every_queue_event_and_dead_letter_queue_has_a_channel() {
        let doc = document().unwrap();
        let addresses: Vec<&str> =
            doc["channels"].as_object().unwrap().values().map(|c| c["address"].as_str().unwrap()).collect();
        for queue in queues::ALL {
            assert!(addresses.contains(&address(queue).as_str()), "{queue}");
            assert!(addresses.contains(&address(&names::dead_letter_queue(queue)).as_str()), "dlq of {queue}");
        }
        for event_type in EventType::ALL {
            assert!(addresses.contains(&format!("imagepipe.events.{event_type}").as_str()), "{event_type}");
        }
        assert!(addresses.contains(&"imagepipe.events.image") && addresses.contains(&"imagepipe.events.task"));
        assert!(addresses.contains(&"imagepipe.dlq.events.{group}"));
    }
}
