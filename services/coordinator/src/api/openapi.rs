//! The OpenAPI 3.1 document of the coordinator's API — its own routes and those it forwards
//! ([`forward`](super::forward)) — with schemas generated from the handlers' types (JSON
//! Schema 2020-12, as OpenAPI 3.1 takes it). Descriptions come from doc comments, with their
//! rustdoc link syntax removed in one pass ([`plain_text`]).

use schemars::generate::{SchemaGenerator, SchemaSettings};
use serde_json::{Map, Value, json};

use super::batch::{BATCH_BODY_BYTES, BatchResponse, MAX_BATCH};
use super::blobs::Uploaded;
use super::dlq_replay::{ReplayFilter, ReplayReport};
use super::forward::Upstream;
use super::queue_control::{ConcurrencyRequest, QueueView, QueuesView};
use super::{Accepted, ApiError, CancelRequest, History, JSON_BODY_BYTES, MAX_LIMIT, Replayed, StartedJob, TaskView};
use crate::api::DeadLetterListing;
use crate::reprocess::{ReprocessJob, ReprocessRequest};
use crate::store::TaskPage;
use crate::task::TaskState;
use imagepipe_analytics_worker::api::StatsResponse;
use imagepipe_contracts::SubmitTask;
use imagepipe_tag_indexer_worker::api::{MAX_LIMIT as SEARCH_MAX_LIMIT, SearchResponse};

/// The pattern of a task id (`is_valid_id`).
const ID_PATTERN: &str = "^[A-Za-z0-9_.-]{1,128}$";

/// The schemas of the document's bodies, by the name the operations refer to them with.
struct Schemas {
    generator: SchemaGenerator,
    refs: Vec<(&'static str, Value)>,
}

impl Schemas {
    fn new() -> Self {
        let settings = SchemaSettings::draft2020_12().with(|s| {
            s.definitions_path = "/components/schemas".into();
            s.meta_schema = None;
        });
        Self { generator: settings.into_generator(), refs: Vec::new() }
    }

    fn add<T: schemars::JsonSchema>(&mut self, name: &'static str) {
        let schema = self.generator.subschema_for::<T>();
        self.refs.push((name, serde_json::to_value(schema).expect("schemas serialize")));
    }

    fn get(&self, name: &str) -> Value {
        self.refs.iter().find(|(n, _)| *n == name).map(|(_, s)| s.clone()).expect("a schema added above")
    }
}

/// The document served at `/v1/openapi.json`.
pub fn document() -> Value {
    let mut schemas = Schemas::new();
    schemas.add::<SubmitTask>("SubmitTask");
    schemas.add::<Accepted>("Accepted");
    schemas.add::<TaskView>("TaskView");
    schemas.add::<TaskPage>("TaskPage");
    schemas.add::<History>("History");
    schemas.add::<CancelRequest>("CancelRequest");
    schemas.add::<DeadLetterListing>("DeadLetterListing");
    schemas.add::<Replayed>("Replayed");
    schemas.add::<Uploaded>("Uploaded");
    schemas.add::<SearchResponse>("SearchResponse");
    schemas.add::<StatsResponse>("StatsResponse");
    schemas.add::<QueueView>("QueueView");
    schemas.add::<QueuesView>("QueuesView");
    schemas.add::<ConcurrencyRequest>("ConcurrencyRequest");
    schemas.add::<ReprocessRequest>("ReprocessRequest");
    schemas.add::<ReprocessJob>("ReprocessJob");
    schemas.add::<StartedJob>("StartedJob");
    schemas.add::<ApiError>("Error");
    schemas.add::<BatchResponse>("BatchResponse");
    schemas.add::<ReplayFilter>("ReplayFilter");
    schemas.add::<ReplayReport>("ReplayReport");
    let schema = |name: &str| schemas.get(name);
    let json_content = |name: &str| json!({ "application/json": { "schema": schema(name) } });
    let ok = |description: &str, name: &str| json!({ "description": description, "content": json_content(name) });
    let error = |description: &str| ok(description, "Error");
    let id_param = |what: &str| {
        json!({ "name": "id", "in": "path", "required": true, "description": what,
                "schema": { "type": "string", "pattern": ID_PATTERN } })
    };
    let query = |name: &str, description: &str, schema: Value| json!({ "name": name, "in": "query", "required": false, "description": description, "schema": schema });
    let page_limit =
        || query("limit", "Page size (default 50)", json!({ "type": "integer", "minimum": 1, "maximum": MAX_LIMIT }));
    let cursor = || query("cursor", "nextCursor of the previous page", json!({ "type": "string" }));
    let label_caps =
        (imagepipe_contracts::command::MAX_LABEL_KEY_LEN, imagepipe_contracts::command::MAX_LABEL_VALUE_LEN);
    let too_large = |bytes: String| error(&format!("The body is larger than {bytes} (the message names the limit)"));
    let busy = |limit: &str| {
        let mut answer = error(&format!("Busy: {limit}; try again after Retry-After"));
        answer["headers"] = json!({ "Retry-After": {
            "description": "Seconds to wait before trying again", "schema": { "type": "integer", "minimum": 1 }
        } });
        answer
    };
    // An empty `status` is no filter, as an absent one.
    let states: Vec<&str> = TaskState::ALL.iter().map(|s| s.as_str()).chain([""]).collect();
    let task_links: Map<String, Value> = ["getTask", "getTaskHistory", "cancelTask"]
        .into_iter()
        .map(|op| (op.to_owned(), json!({ "operationId": op, "parameters": { "id": "$response.body#/taskId" } })))
        .collect();

    let mut paths = json!({
        "/v1/tasks": {
            "post": {
                "operationId": "submitTask",
                "summary": "Submit a task",
                "requestBody": { "required": true, "content": { "application/json": {
                    "schema": schema("SubmitTask"),
                    "example": { "taskId": "tsk_photo_0001", "url": "https://example.com/cat.jpg", "labels": { "album": "summer" } }
                } } },
                "responses": {
                    "202": {
                        "description": "Accepted (or the existing task of this id or idempotency key)",
                        "headers": { "Location": { "schema": { "type": "string" }, "description": "The task's URL" } },
                        "content": json_content("Accepted"),
                        "links": task_links
                    },
                    "400": error("Malformed JSON, a wrong field type, or a submit that breaks a rule (the message names it)"),
                    "409": error("The taskId names a task with another source (Location names it)"),
                    "413": too_large(format!("{JSON_BODY_BYTES} bytes"))
                }
            },
            "get": {
                "operationId": "listTasks",
                "summary": "A page of tasks, oldest or newest first, filtered by state, creation time and label",
                "description": format!(
                    "Tasks in creation order (within status=queued: higher priorities first, then creation order), \
                     oldest first or, with order=newest, newest first. createdAfter and createdBefore bound the scan \
                     (except within status=queued, where they filter as label does). A label filter is applied while \
                     scanning, at most {} tasks per page: such a page may be shorter than limit, even \
                     empty, and still have a nextCursor; the listing ends at the first page without one. A cursor is a \
                     position: given with the other order, the listing goes on from it the other way.",
                    crate::store::LABEL_SCAN_LIMIT
                ),
                "parameters": [
                    query("status", "Only tasks in this state (empty: every state)", json!({ "type": "string", "enum": states })),
                    page_limit(),
                    cursor(),
                    query("order", "oldest (default) or newest first (empty: oldest)", json!({ "type": "string", "enum": ["oldest", "newest", ""] })),
                    query("createdAfter", "Only tasks created at or after this time, Unix ms", json!({ "type": "integer", "minimum": 0, "maximum": u64::MAX })),
                    query("createdBefore", "Only tasks created before this time, Unix ms; must be greater than createdAfter (else 400)", json!({ "type": "integer", "minimum": 0, "maximum": u64::MAX })),
                    query(
                        "label",
                        &format!("Only tasks with this label: key=value, split at the first =; the key 1 to {} bytes, \
                                  the value at most {} bytes (empty: no filter). Filtered while scanning: see the description.",
                                 label_caps.0, label_caps.1),
                        json!({ "type": "string", "pattern": "^(?:$|[^=]+=)", "maxLength": label_caps.0 + 1 + label_caps.1 })
                    )
                ],
                "responses": {
                    "200": ok("A page (short or empty with a nextCursor when a filtered scan reached its bound)", "TaskPage"),
                    "400": error("A bad parameter (the message names it): status, limit, cursor, order, createdAfter, createdBefore (not a Unix-ms time, or createdAfter not before it), label (no =, an empty key, over the label caps)")
                }
            }
        },
        "/v1/tasks/{id}": {
            "get": {
                "operationId": "getTask",
                "summary": "A task: state, each step's output and attempts, last error",
                "parameters": [id_param("Task id")],
                "responses": { "200": ok("The task", "TaskView"), "400": error("Not a task id"), "404": error("No such task") }
            }
        },
        "/v1/tasks/{id}/history": {
            "get": {
                "operationId": "getTaskHistory",
                "summary": "Every transition of a task with its time",
                "parameters": [id_param("Task id")],
                "responses": { "200": ok("The history", "History"), "400": error("Not a task id"), "404": error("No such task") }
            }
        },
        "/v1/tasks/{id}/cancel": {
            "post": {
                "operationId": "cancelTask",
                "summary": "Cancel a task; it stops at the next step boundary",
                "parameters": [id_param("Task id")],
                "requestBody": { "required": false, "content": json_content("CancelRequest") },
                "responses": {
                    "202": ok("Cancelled, or cancelling at the step boundary", "TaskView"),
                    "400": error("Not a task id, or a malformed body"),
                    "404": error("No such task"),
                    "409": error("The task already finished"),
                    "413": too_large(format!("{JSON_BODY_BYTES} bytes"))
                }
            }
        },
        "/v1/events": {
            "get": {
                "operationId": "watchEvents",
                "summary": "Server-Sent Events of the event topics (each `data` is an event envelope)",
                "description": "Each event's SSE `id` is its `eventId` and its SSE `event` its `eventType`. A client that \
                    reconnects with `Last-Event-ID` (browsers' EventSource does) gets the events that followed that one \
                    first, when this coordinator still holds them (the last 1,024 while it was fed without a break); \
                    otherwise the stream starts with an event `reset`, after which the client should reload what it \
                    shows. An event `lagged` (`{\"missed\": n}`) says a slow client missed n events.",
                "parameters": [
                    query("taskId", "Only events of this task", json!({ "type": "string", "pattern": ID_PATTERN })),
                    query("type", "Event type selector, e.g. `task.completed || task.failed` or `image.*`", json!({ "type": "string" })),
                    {
                        "name": "Last-Event-ID",
                        "in": "header",
                        "required": false,
                        "description": "Resume after this event (the `id` of the last event received)",
                        "schema": { "type": "string", "maxLength": 128 }
                    }
                ],
                "responses": {
                    "200": { "description": "An event stream", "content": { "text/event-stream": { "schema": { "type": "string" } } } },
                    "400": error("A bad parameter"),
                    "503": error("Too many event streams at once (http.max_sse_clients)")
                }
            }
        },
        "/v1/dlq": {
            "get": {
                "operationId": "listDeadLetters",
                "summary": "Dead letters, oldest first",
                "parameters": [page_limit(), cursor()],
                "responses": { "200": ok("A page of the archive, and how many letters it holds", "DeadLetterListing"), "400": error("A bad parameter") }
            }
        },
        "/v1/dlq/{id}": {
            "delete": {
                "operationId": "purgeDeadLetter",
                "summary": "Purge a dead letter",
                "parameters": [{ "name": "id", "in": "path", "required": true, "schema": { "type": "string" }, "description": "Dead letter id" }],
                "responses": { "204": { "description": "Purged" }, "404": error("No such dead letter") }
            }
        },
        "/v1/dlq/{id}/replay": {
            "post": {
                "operationId": "replayDeadLetter",
                "summary": "Send a dead letter back to its queue and remove it",
                "parameters": [{ "name": "id", "in": "path", "required": true, "schema": { "type": "string" }, "description": "Dead letter id" }],
                "responses": {
                    "202": ok("Replayed", "Replayed"),
                    "404": error("No such dead letter"),
                    "409": error("Its source is not a task queue, or the archive kept only part of its body")
                }
            }
        },
        "/v1/blobs": {
            "post": {
                "operationId": "uploadBlob",
                "summary": "Upload an image; submit its key as {\"blob\": key}",
                "requestBody": { "required": true, "content": { "application/octet-stream": { "schema": { "type": "string", "format": "binary" } } } },
                "responses": {
                    "201": {
                        "description": "Stored (or already stored: keys are content addresses)",
                        "content": json_content("Uploaded"),
                        "links": { "getBlob": { "operationId": "getBlob", "parameters": { "key": "$response.body#/key" } } }
                    },
                    "400": error("An empty body"),
                    "413": too_large("download.max_bytes".to_owned()),
                    "415": error("The bytes are not an image (the message says what they look like); judged by the first bytes, before the rest is read"),
                    "503": busy("http.max_uploads uploads are being received at once")
                }
            }
        },
        "/v1/blobs/{key}": {
            "get": {
                "operationId": "getBlob",
                "summary": "An image or thumbnail by key",
                "parameters": [{ "name": "key", "in": "path", "required": true, "description": "sha256:<64 hex digits>",
                                 "schema": { "type": "string", "pattern": "^sha256:[0-9a-f]{64}$" } }],
                "responses": {
                    "200": { "description": "The bytes, typed by their magic numbers", "content": { "image/*": { "schema": { "type": "string", "format": "binary" } } } },
                    "400": error("Not a blob key"),
                    "404": error("No such blob")
                }
            }
        },
        "/v1/openapi.json": {
            "get": {
                "operationId": "openapiDocument",
                "summary": "This document",
                "responses": { "200": { "description": "OpenAPI 3.1", "content": { "application/json": { "schema": { "type": "object" } } } } }
            }
        },
        "/v1/search": {
            "get": {
                "operationId": "searchTags",
                "summary": "Tasks by tag, best first (the tag indexer's)",
                "parameters": [
                    { "name": "tags", "in": "query", "required": true, "description": "Comma-separated tags, e.g. `cat,animal` (at most 32)",
                      "schema": { "type": "string", "minLength": 1 } },
                    query("mode", "Whether a task needs all tags (default) or any", json!({ "type": "string", "enum": ["all", "any"] })),
                    query("limit", "Most results (default 20)", json!({ "type": "integer", "minimum": 1, "maximum": SEARCH_MAX_LIMIT }))
                ],
                "responses": { "200": ok("Matching tasks", "SearchResponse"), "400": error("A bad parameter") }
            }
        },
        "/v1/stats": {
            "get": {
                "operationId": "getStats",
                "summary": "Counters and stage latencies (the analytics worker's)",
                "responses": { "200": ok("Counters, and per span a histogram with percentiles", "StatsResponse") }
            }
        },
        "/v1/tasks/{id}/similar": {
            "get": {
                "operationId": "getSimilarTasks",
                "summary": "Images similar to a task's (the similarity indexer's)",
                "parameters": [id_param("Task id"), {
                    "name": "limit", "in": "query", "required": false,
                    "description": "Most results (1-100, default 10)",
                    "schema": { "type": "integer", "minimum": 1, "maximum": 100 }
                }],
                "responses": {
                    "200": { "description": "The task's embedding version and the most similar tasks, closest first (taskId, cosine, phashDistance, thumbnailKey)", "content": { "application/json": { "schema": { "type": "object" } } } },
                    "400": error("A bad limit")
                }
            }
        },
        "/v1/search/similar": {
            "post": {
                "operationId": "searchSimilar",
                "summary": "Images similar to the one given (the similarity indexer's): the model runs on it",
                "parameters": [{
                    "name": "limit", "in": "query", "required": false,
                    "description": "Most results (1-100, default 10)",
                    "schema": { "type": "integer", "minimum": 1, "maximum": 100 }
                }],
                "requestBody": { "required": true, "content": {
                    "application/octet-stream": { "schema": { "type": "string", "format": "binary" } },
                    "application/json": { "schema": { "type": "object", "required": ["blobKey"],
                        "properties": { "blobKey": { "type": "string", "description": "A stored blob, sha256:<hex>" } } } }
                } },
                "responses": {
                    "200": { "description": "The most similar tasks, closest first", "content": { "application/json": { "schema": { "type": "object" } } } },
                    "400": error("An empty body, a bad limit or blobKey, or an image the model cannot read"),
                    "404": error("No blob of that blobKey"),
                    "413": too_large("download.max_bytes (a few KiB for a JSON body)".to_owned()),
                    "415": error("The bytes are not an image (the message says what they look like); judged by the first bytes, before the rest is read"),
                    "503": busy("http.max_uploads searches at once, every model slot taken for similarity.model_wait, or the model not loaded (model_unavailable, without Retry-After)")
                }
            }
        },
        "/v1/duplicates": {
            "get": {
                "operationId": "getDuplicates",
                "summary": "Groups of near-duplicate images (the similarity indexer's)",
                "parameters": [{
                    "name": "threshold", "in": "query", "required": false,
                    "description": "Cosine a pair needs, from similarity.pair_floor to 1 (default similarity.duplicate_threshold); a pair within similarity.phash_max_distance counts too",
                    "schema": { "type": "number", "maximum": 1 }
                }, {
                    "name": "limit", "in": "query", "required": false,
                    "description": "Most groups (1-1000, default 100), largest first",
                    "schema": { "type": "integer", "minimum": 1, "maximum": 1000 }
                }],
                "responses": {
                    "200": { "description": "Near-duplicate groups", "content": { "application/json": { "schema": { "type": "object" } } } },
                    "400": error("A threshold outside similarity.pair_floor..1, or a bad limit")
                }
            }
        },
        "/v1/similarity/rebuild": {
            "post": {
                "operationId": "startSimilarityRebuild",
                "summary": "Rebuild the similarity index from the retained event stream (the similarity indexer's)",
                "responses": { "202": { "description": "The rebuild started: its status", "content": { "application/json": { "schema": { "type": "object" } } } },
                                "409": { "description": "A rebuild is already running on that replica", "content": { "application/json": { "schema": { "type": "object" } } } } }
            },
            "get": {
                "operationId": "getSimilarityRebuild",
                "summary": "How the latest rebuild of the similarity index went (running, done, failed; events read; duration)",
                "responses": { "200": { "description": "The latest rebuild's status", "content": { "application/json": { "schema": { "type": "object" } } } } }
            }
        }
    });
    // The operator controls (issue 18): queues, task pause/resume, reprocessing.
    let stage_param = json!({ "name": "queue", "in": "path", "required": true,
        "description": "The stage queue: download, metadata or ai (or its full name, tasks.download)",
        "schema": { "type": "string", "enum": ["download", "metadata", "ai", "tasks.download", "tasks.metadata", "tasks.ai"] } });
    let queue_change = |summary: &str, id: &str| {
        json!({ "post": {
        "operationId": id,
        "summary": summary,
        "parameters": [stage_param.clone()],
        "requestBody": { "required": false, "content": json_content("CancelRequest") },
        "responses": {
            "200": ok("The queue after the change", "QueueView"),
            "400": error("A malformed body"),
            "404": error("No such stage queue"),
            "413": too_large(format!("{JSON_BODY_BYTES} bytes")),
            "503": error("The control state could not be written")
        }
    } })
    };
    let task_change = |summary: &str, id: &str, body: bool| {
        let mut operation = json!({
            "operationId": id,
            "summary": summary,
            "parameters": [id_param("Task id")],
            "responses": {
                "202": ok("The task after the request", "TaskView"),
                "400": error("Not a task id, or a malformed body"),
                "404": error("No such task"),
                "409": error("The task's state has no such move (it finished)")
            }
        });
        if body {
            operation["requestBody"] = json!({ "required": false, "content": json_content("CancelRequest") });
            operation["responses"]["413"] = too_large(format!("{JSON_BODY_BYTES} bytes"));
        }
        json!({ "post": operation })
    };
    let control = json!({
        "/v1/queues": { "get": {
            "operationId": "listQueues",
            "summary": "Every stage queue: depth per priority lane, in flight, oldest wait, rate over a minute, consumers, concurrency, paused",
            "responses": { "200": ok("The stage queues", "QueuesView"), "503": error("The broker or the control state could not be read") }
        } },
        "/v1/queues/{queue}/pause": queue_change("Pause a stage queue on every replica within a second (in-flight messages finish)", "pauseQueue"),
        "/v1/queues/{queue}/resume": queue_change("Resume a paused stage queue", "resumeQueue"),
        "/v1/queues/{queue}/concurrency": { "put": {
            "operationId": "setQueueConcurrency",
            "summary": "Set the messages each replica of a stage handles at once, without a restart",
            "parameters": [stage_param.clone()],
            "requestBody": { "required": true, "content": json_content("ConcurrencyRequest") },
            "responses": {
                "200": ok("The queue after the change", "QueueView"),
                "400": error("perReplica is not 1 to 1024 or null, or a malformed body"),
                "404": error("No such stage queue"),
                "413": too_large(format!("{JSON_BODY_BYTES} bytes")),
                "503": error("The control state could not be written")
            }
        } },
        "/v1/tasks/{id}/pause": task_change("Pause a task at its next step boundary (at once when no step runs)", "pauseTask", true),
        "/v1/tasks/{id}/resume": task_change("Resume a paused task (or withdraw a pending pause)", "resumeTask", false),
        "/v1/tasks/{id}/retry": task_change("Run a failed or cancelled task again from the first step whose output it lacks, as a new generation", "retryTask", false),
        "/v1/reprocess": { "post": {
            "operationId": "startReprocess",
            "summary": "Run a step and the ones after it again for matching finished tasks, as a new generation",
            "requestBody": { "required": true, "content": { "application/json": {
                "schema": schema("ReprocessRequest"),
                "example": { "from": "analyze", "select": "all", "filter": { "model": "not-current" }, "priority": "low" }
            } } },
            "responses": {
                "200": ok("A job of an identical request runs already: that job (`created` false)", "StartedJob"),
                "202": ok("The job, started (`created` true)", "StartedJob"),
                "400": error("A malformed request (the message names the field)"),
                "413": too_large(format!("{JSON_BODY_BYTES} bytes")),
                "429": error("coordinator.max_reprocess_jobs jobs run already: wait for one to end or cancel one"),
                "503": error("The control state could not be written")
            }
        } },
        "/v1/reprocess/{id}": {
            "get": {
                "operationId": "getReprocess",
                "summary": "A reprocessing job's progress",
                "parameters": [id_param("Job id")],
                "responses": { "200": ok("The job", "ReprocessJob"), "400": error("Not a job id"), "404": error("No such job (kept 7 days)") }
            },
            "delete": {
                "operationId": "cancelReprocess",
                "summary": "Cancel a running reprocessing job (the tasks it reprocessed so far go on)",
                "parameters": [id_param("Job id")],
                "responses": {
                    "202": ok("The job: `cancelled` once stopped, still `running` while the replica running it stops it", "ReprocessJob"),
                    "400": error("Not a job id"),
                    "404": error("No such job (kept 7 days)"),
                    "409": error("The job is not running (done, failed or cancelled)"),
                    "503": error("The control state could not be read or written")
                }
            }
        }
    });
    for (path, item) in control.as_object().expect("an object") {
        paths[path] = item.clone();
    }
    // Batch submit and bulk dead-letter replay (issue 18).
    paths["/v1/tasks:batch"] = json!({
        "post": {
            "operationId": "submitTaskBatch",
            "summary": "Submit up to 1000 tasks; one result per item, in order (a refused item never fails the others)",
            "requestBody": { "required": true, "content": { "application/json": {
                "schema": {
                    "type": "object",
                    "additionalProperties": false,
                    "required": ["tasks"],
                    "properties": { "tasks": {
                        "type": "array",
                        "minItems": 1,
                        "maxItems": MAX_BATCH,
                        "description": "Submit commands as POST /v1/tasks takes them. An item that is not one is refused on its own (its result names the problem), so any JSON value is taken here.",
                        "items": { "anyOf": [schema("SubmitTask"), {}] }
                    } }
                },
                "example": { "tasks": [
                    { "url": "https://example.com/cat.jpg", "priority": "low" },
                    { "taskId": "tsk_photo_0002", "blob": format!("sha256:{}", "0".repeat(64)), "labels": { "album": "summer" } }
                ] }
            } } },
            "responses": {
                "200": ok("One result per item: {index, taskId, state, created} or {index, error: {code, message}}", "BatchResponse"),
                "400": error("Not a JSON object with a `tasks` array of 1 to 1000 items"),
                "413": too_large(format!("{BATCH_BODY_BYTES} bytes")),
                "503": error("The store failed for the whole batch; try again")
            }
        }
    });
    paths["/v1/dlq/replay"] = json!({
        "post": {
            "operationId": "replayDeadLetters",
            "summary": "Replay every dead letter a filter matches (or count them: dryRun)",
            "description": "Scans the archive oldest first and replays each matching letter from a task queue as POST /v1/dlq/{id}/replay does. Letters that can never be replayed (not from a task queue, body cut) are counted as skipped and left in the archive.",
            "requestBody": { "required": true, "content": { "application/json": {
                "schema": schema("ReplayFilter"),
                "example": { "queue": "download", "reasonContains": "timeout", "since": 1_763_800_000_000_u64, "max": 100, "dryRun": true }
            } } },
            "responses": {
                "200": ok("What matched and what was replayed", "ReplayReport"),
                "400": error("No filter (give one, or \"all\": true), an unknown queue, or a value out of range"),
                "413": too_large(format!("{JSON_BODY_BYTES} bytes")),
                "503": error("The store or the broker failed; try again")
            }
        }
    });
    for upstream in Upstream::ALL {
        for &(path, _) in upstream.routes() {
            let operations = paths[path].as_object_mut().expect("every forwarded route is documented");
            for operation in operations.values_mut() {
                let service = upstream.service();
                let (key, variable) = (upstream.key(), upstream.variable());
                operation["description"] =
                    json!(format!("Served by {service}; the coordinator forwards it to {key} ({variable})."));
                let responses = operation["responses"].as_object_mut().expect("responses");
                let not_configured =
                    format!("Not configured here: the message names {key}; or, from {service}, not found");
                responses.entry("404").or_insert_with(|| error(&not_configured));
                responses.insert("502".into(), error(&format!("{service} could not be reached")));
                responses.insert("504".into(), error(&format!("{service} did not answer in time")));
            }
        }
    }
    for operations in paths.as_object_mut().expect("paths").values_mut() {
        for operation in operations.as_object_mut().expect("operations").values_mut() {
            let responses = operation["responses"].as_object_mut().expect("responses");
            responses.insert("401".into(), error("No or a wrong bearer token (with http.auth_token set)"));
            responses.entry("403").or_insert_with(|| {
                error(
                    "The token's scope is below what the route needs (forbidden), a browser's cross-site request \
                     (cross_origin) or a dashboard session without its CSRF token (csrf); without a token, a \
                     loopback client naming another Host (forbidden_host)",
                )
            });
            let mut throttled = error(
                "Too many wrong tokens from this client address within http.auth_failure_window \
                 (http.auth_failure_limit); wait Retry-After seconds",
            );
            throttled["headers"] = json!({ "Retry-After": { "schema": { "type": "integer" } } });
            responses.entry("429").or_insert(throttled);
        }
    }
    let components = schemas.generator.take_definitions(true);
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
    use super::*;

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
        let mut ids = std::collections::BTreeSet::new();
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
            for &(path, _) in upstream.routes() {
                let operations = document["paths"][path].as_object().unwrap_or_else(|| panic!("{path} documented"));
                for (method, operation) in operations {
                    let responses = operation["responses"].as_object().unwrap();
                    assert!(responses.keys().any(|s| s.starts_with('2')), "{method} {path}: a success");
                    for status in ["404", "502", "504"] {
                        assert!(responses.get(status).is_some(), "{method} {path}: {status}");
                    }
                    assert!(operation["description"].as_str().unwrap().contains(upstream.key()), "{path}");
                }
            }
        }
        let search = &document["paths"]["/v1/search"]["get"]["responses"]["200"]["content"]["application/json"];
        assert_eq!(search["schema"]["$ref"], "#/components/schemas/SearchResponse");
    }
}
